"""The relay's durable state: every delivery, change, run, shard, result and outgoing report."""
