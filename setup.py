"""composer_rl: JAX-native RL post-training for LLM coding agents."""
import setuptools

setuptools.setup(
    name="composer_rl",
    version="0.1.0",
    description="RL post-training of LLM coding agents in JAX: exact sampler/trainer parity, "
    "sandboxed coding environments, async rollouts, sparse weight sync.",
    packages=setuptools.find_packages(include=["composer_rl", "composer_rl.*"]),
    # The real-repository task demo ships a trimmed copy of toolz and the tasks built from it.
    # The rollout viewer's static page (HTML/JS/CSS) is copied into each run's viewer/.
    package_data={"composer_rl.env": ["data/*.json", "data/toolz-1.2.0/**/*"],
                  "composer_rl.viewer": ["assets/*"]},
    python_requires=">=3.11",
    # Parity (bit-identical sampler and trainer logprobs) is a property of the exact XLA
    # build, so jax/jaxlib are pinned to the minor series the parity suite was run on.
    install_requires=[
        "jax[cpu]>=0.10.2,<0.11",
        "flax>=0.12.8,<0.13",
        "optax>=0.2.5",
        "orbax-checkpoint>=0.12.8,<0.13",
        "grain>=0.2.18",
        "ml_collections>=1.0",
        "absl-py>=2.0",
        "numpy>=1.26",
        "tensorboardX>=2.6",
        "matplotlib>=3.8",
        # Progress (count, rate, ETA) of long phases, in a terminal and in log files.
        "tqdm>=4.66",
        # The OpenAI-compatible server (launch/serve.py, composer_rl/serving) and the
        # scripted user of the online-RL experiment (the official client, as users run it).
        "fastapi>=0.110",
        "uvicorn>=0.29",
        "openai>=1.30",
    ],
    extras_require={
        # selenium drives Debian's headless Chromium in the viewer tests (.ci/run installs it)
        "test": ["pytest>=8", "pytest-xdist>=3.5", "selenium>=4.20"],
        "jetstream": ["google-jetstream==0.2.2"],
        # The peer benchmark (composer_rl.bench.peer) measures tunix's sampler when it is
        # importable; install with --no-deps as composer_rl/bench/peer_tunix.py says (its own
        # requirements would downgrade the hf extra). Never in CI.
        "peer": ["google-tunix==0.1.7"],
        # Hugging Face Qwen3 import/export is numpy-only; these run its reference tests
        # (transformers on PyTorch CPU) and load real tokenizers (composer_rl.data.hf_tokenizer).
        "hf": ["torch==2.13.0", "transformers>=5,<6", "safetensors>=0.4", "tokenizers>=0.21"],
    },
)
