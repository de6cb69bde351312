"""``python -m sglang.launch_server`` with LOOKAHEAD's CPU overlap guard lifted.

SGLang runs speculative decoding without overlap scheduling on CPU, and so
does LOOKAHEAD (``lookahead.plugin.arg_rules.disable_overlap_on_cpu``). On CPU
torch streams are stubs, so an overlapped server runs its forwards in order
and processes each result one step late: exactly the relay, splice and feed
logic of the GPU overlap path, without its speed. This launcher lifts the
guard for the one server a test starts with it.
"""

import runpy
import sys

import lookahead.plugin.arg_rules as lookahead_args

lookahead_args.disable_overlap_on_cpu = lambda server_args: None
sys.argv = ["sglang.launch_server", *sys.argv[1:]]
runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)
