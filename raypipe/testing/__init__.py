"""Helpers for testing raypipe, and your own setup, without a cloud: nothing here runs on import."""

__all__ = ["S3Server", "FakeAutoscalingCluster", "InProcessWorkers", "ByteTokens"]


def __getattr__(name: str):
    # Imported on first use, so ``python -m raypipe.testing.s3server`` does not import the module twice.
    if name == "S3Server":
        from raypipe.testing.s3server import S3Server

        return S3Server
    if name == "FakeAutoscalingCluster":
        from raypipe.testing.autoscaler import FakeAutoscalingCluster

        return FakeAutoscalingCluster
    if name == "InProcessWorkers":
        from raypipe.testing.workers import InProcessWorkers

        return InProcessWorkers
    if name == "ByteTokens":
        from raypipe.testing.fields import ByteTokens

        return ByteTokens
    raise AttributeError(f"module 'raypipe.testing' has no attribute {name!r}")
