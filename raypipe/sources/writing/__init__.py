"""Writing datasets: ``convert`` writes any source as WebDataset or Parquet shards, one per Ray task."""
