"""The training job: timm-style flags, a Ray Train ``TorchTrainer``, exactly-once epochs across ranks."""

from raypipe.integrations.ray_train import ray_loader
from raypipe.train.args import TrainJobConfig, build_parser, parse_job
from raypipe.train.run import run_training

__all__ = ["TrainJobConfig", "build_parser", "parse_job", "ray_loader", "run_training"]
