"""LOOKAHEAD's add-corpus request (SGLang's, with a ``scope``) crosses
processes the way SGLang sends it: pickled over ZMQ.  With ``--dp-size`` the
data-parallel controller unpickles it before passing it on to every replica,
in a process that never made the type; it must resolve there by name (this
took a whole server down before)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

UNPICKLE = (
    "import pickle, sys\n"
    "req = pickle.loads(sys.stdin.buffer.read())\n"
    "print(type(req).__name__, req.corpus_id, req.scope, req.token_chunks)\n"
)


def test_an_add_request_unpickles_in_a_process_that_never_made_its_type():
    from lookahead.plugin.corpus_server import request_type

    req = request_type()(corpus_id="manual", token_chunks=[[5, 6, 7]], scope="cache_salt:acme")
    out = subprocess.run([sys.executable, "-c", UNPICKLE], input=pickle.dumps(req), capture_output=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, timeout=300)
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    assert out.stdout.decode().split("\n")[-2] == "LookaheadAddExternalCorpusReqInput manual cache_salt:acme [[5, 6, 7]]"
