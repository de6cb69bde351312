"""Pure-torch stand-in for the part of ``flashinfer`` SGLang reaches with
``SGLANG_IS_FLASHINFER_AVAILABLE=false`` and the triton attention backend:
the top-k / top-p renormalisation of sampled tree verification (testing only;
see ``sgl_kernel`` beside this package)."""
