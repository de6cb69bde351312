"""Stand-in for IPython on the bare GPU machine: ``sglang.utils`` imports
``IPython.display`` at module level, for notebook helpers a server never uses."""
