"""Indexes of WebDataset shards: raypipe's own (``shard_index``, written over Ray tasks by ``indexer``) and
the ones other tools write (``foreign_index``: wids shard lists, DALI's .idx files)."""
