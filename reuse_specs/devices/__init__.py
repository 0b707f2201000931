"""``TORCH_TEST_DEVICES`` files for devices whose tests PyTorch does not instantiate itself."""
