"""Helpers for testing raypipe, and your own setup, without a cloud: nothing here runs on import."""

from raypipe.testing.s3server import S3Server

__all__ = ["S3Server"]
