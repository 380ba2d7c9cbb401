"""The dataset formats raypipe lists: an image folder, Parquet, a CSV/JSONL manifest, WebDataset tar shards
and a Ray Dataset, one module each (with the shards' paths, members and by-shard listing beside
WebDataset's); ``registry.FORMATS`` is the one table of them that detection and listing read."""
