"""``python -m lookahead.replay``: the model-free acceptance replay."""

import sys

from lookahead.replay import main

sys.exit(main())
