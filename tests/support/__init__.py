"""Stand-ins for torch_npu used by the tests (no NPU or CANN needed)."""
