"""Running shards of upstream tests in isolation, without losing results to crashes."""
