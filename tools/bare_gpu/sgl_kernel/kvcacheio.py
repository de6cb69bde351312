"""``sgl_kernel.kvcacheio``: host KV transfers (HiCache), never run here.
``get_device_accessible_ptr`` is a capability probe and stays absent."""

from ._stubs import stub

_NAMES = [
    "transfer_embedding_ranges_direct", "transfer_kv_all_layer", "transfer_kv_all_layer_direct_lf_pf",
    "transfer_kv_all_layer_lf_pf", "transfer_kv_all_layer_lf_ph", "transfer_kv_all_layer_mla",
    "transfer_kv_all_layer_mla_lf_pf", "transfer_kv_direct", "transfer_kv_per_layer",
    "transfer_kv_per_layer_direct_pf_lf", "transfer_kv_per_layer_mla", "transfer_kv_per_layer_mla_pf_lf",
    "transfer_kv_per_layer_pf_lf", "transfer_kv_per_layer_ph_lf",
]
globals().update({name: stub(f"sgl_kernel.kvcacheio.{name}") for name in _NAMES})
