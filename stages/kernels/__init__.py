"""Pure kernels over columnar batches: no I/O, no logging, no globals."""
