"""Testing utilities shared by the test suite, the scripts, the examples and the benchmarks (as torch.testing).

Modules are imported on use: ``torch_neuronx.testing.fuzz`` (the differential
fuzzer), ...
"""
