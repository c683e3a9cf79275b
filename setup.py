"""tfcluster: run graph-mode TensorFlow 1 code on clusters."""
from setuptools import find_packages, setup

setup(
    name="tfcluster",
    version="0.1.0",
    description="Run graph-mode TensorFlow 1 (tf.compat.v1) code on clusters: specs, servers, launcher, "
                "parameter-server training.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    packages=find_packages(include=["tfcluster", "tfcluster.*"]),
    install_requires=[
        "tensorflow-cpu==2.21.0",
        "grpcio>=1.60",
        "psutil>=5.9",
    ],
    extras_require={
        "test": ["pytest>=7", "pytest-timeout>=2.1", "scikit-learn>=1.3"],
        # The examples train on the UCI digits that ship inside scikit-learn's wheel.
        "examples": ["scikit-learn>=1.3"],
        # No "legacy" extra for tf-keras: it requires the full `tensorflow` wheel,
        # which would overwrite tensorflow-cpu. Install it with --no-deps (README).
        "bench": ["matplotlib>=3.7"],
    },
    entry_points={"console_scripts": ["tfcluster=tfcluster.cli:main"]},
)
