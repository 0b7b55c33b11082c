"""GPU twins of the integer kernels of fuzzy dedup, in torch: the same contracts, the same bits.

Each function here has a CPU reference with the same signature and output (docs/gpu.md):

================================  =============================================
torch twin (this package)         CPU reference
================================  =============================================
``minhash.signatures``            ``stages.kernels.minhash.signatures``
``minhash.shingle_hashes``        ``stages.kernels.minhash._doc_shingle_hashes``
``minhash.band_keys``             ``stages.kernels.lsh.band_keys``
``lsh.band_edges``                ``stages.kernels.lsh.band_edges``
``lsh.pair_jaccard64``            ``stages.kernels.lsh._jaccard64``
``lsh.verify_candidates``         ``stages.kernels.lsh.verify_candidates``
``lsh.connected_components``      ``stages.kernels.lsh.connected_components``
================================  =============================================

Every twin takes a torch ``device``; on ``"cpu"`` it is the same code path as on ``"cuda"``,
which is how CI proves parity without a GPU (tests/stages/kernels/test_gpu_parity.py). uint64 arithmetic is
done on int64 tensors (add, multiply and xor wrap identically mod 2**64; right shifts are made
logical by masking). Importing this package imports nothing; its modules import torch.
"""
