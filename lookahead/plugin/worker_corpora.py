"""The external-corpus methods of ``LookaheadWorker``: what SGLang's
``ExternalCorpusManager`` calls (see ``lookahead.plugin.corpus_server``) and
the corpora named at start (``--speculative-lookahead-corpus``).

A mixin of the worker, kept apart because it is its own concern: reading
and indexing documents, publishing them to every tensor-parallel rank at
the same step, and handing them on to the fleet's other servers.
"""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger("lookahead.plugin.worker")


class ExternalCorpora:
    """Needs the worker's ``cache``, ``args``, ``tp_size``, ``share``,
    ``_target_worker``, ``_dirty`` and ``save_trie``."""


    def _load_startup_corpora(self) -> None:
        """--speculative-lookahead-corpus: read, tokenized and indexed on a
        background thread (drafts use what is indexed so far), unless tensor
        parallelism needs every rank to see the same corpus at every step:
        then here, before the first request."""
        if not self.args.corpus:
            return
        if self.tp_size > 1:
            self._read_startup_corpora()
        else:
            threading.Thread(target=self._read_startup_corpora, name="lookahead-corpus-start", daemon=True).start()

    def _read_startup_corpora(self) -> None:
        from lookahead.trie.corpora import ReadReport, corpus_id_of, read_corpus

        tokenizer = getattr(self._target_worker, "tokenizer", None)
        encode = None if tokenizer is None else (lambda text: tokenizer.encode(text, add_special_tokens=False))
        for path in self.args.corpus:
            corpus_id = corpus_id_of(path)
            if corpus_id in self.cache.corpora():
                logger.info("LOOKAHEAD: corpus %s was loaded from %s", corpus_id, self.args.path)
                continue
            report = ReadReport()
            try:
                chunks = read_corpus(path, encode, self.cache._max_id, report)
                loaded = self.cache.add_corpus(corpus_id, chunks)
            except Exception as exc:  # a bad corpus never takes the server down
                logger.error("LOOKAHEAD: cannot load the corpus %s: %s", path, exc)
                continue
            logger.info("LOOKAHEAD: loaded the corpus %s: %d tokens (%s)", path, loaded, report)
            self._dirty = True

    def add_external_corpus(self, corpus_id: str, token_chunks, scope=None) -> int:
        # Under tensor parallelism every rank must draft the same trees, and
        # the ranks' loads end at different times: the corpus is read from
        # commit_corpus_load, which every rank calls at the same step (the
        # corpus manager waits for all of them, see lookahead.plugin.corpus_server).
        loaded = self.cache.add_corpus(corpus_id, token_chunks, scope, publish=self.tp_size == 1)
        self._dirty = True
        self.share.publish_corpus_add(corpus_id, token_chunks, scope)  # to the fleet's other servers
        return loaded

    def commit_corpus_load(self, corpus_id: str, loaded_token_count: int) -> None:
        # Alone, drafts read a corpus from the start of its load; under tensor
        # parallelism from here. A completed one is saved.
        if self.tp_size > 1:
            self.cache.publish_corpus(corpus_id)
        self.save_trie()

    def remove_external_corpus(self, corpus_id: str) -> None:
        self.cache.remove_corpus(corpus_id)
        self._dirty = True
        self.share.publish_corpus_remove(corpus_id)
        self.save_trie()

    def list_external_corpora(self) -> dict:
        return {cid: info["tokens"] for cid, info in self.cache.corpora().items()}

    def describe_external_corpora(self) -> str:
        return "; ".join(f"{cid}: {i['tokens']:,} tokens, {i['bytes']:,} bytes, "
                         f"{'public' if i['scope'] is None else 'scope ' + i['scope']}, {i['state']}"
                         f"{'' if i['published'] else ' (drafted from once every rank has it)'}"
                         for cid, i in self.cache.corpora().items())
