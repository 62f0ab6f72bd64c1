"""rised_jax: RISED and CriPO, rubric-guided RL for LLMs in JAX."""
import setuptools

# Exact pins: these versions are tested together (docs/quickstart.md, "Versions").
INSTALL_REQUIRES = [
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "ml-collections==1.1.0",
    "absl-py==2.5.1",
    "tensorboard==2.21.0",
    "transformers==5.24.0",
    "tokenizers==0.23.3",
    "safetensors==0.8.0",
    "gguf==0.19.0",
    "jinja2==3.1.6",
    "numpy==2.4.6",
    "scipy==1.17.1",
    "tqdm==4.70.1",
    # The retry policy of the SGLang client and the LLM judges; urllib3 for its Retry-After parser.
    "tenacity==9.1.4",
    "urllib3==2.8.0",
]

EXTRAS_REQUIRE = {
    # LLM judges at scale: Gemini through google-genai, any OpenAI-compatible server (SGLang).
    "judge": ["google-genai==3.6.1", "openai==3.57.0"],
    # Notebooks and their plots.
    "notebooks": ["matplotlib==3.11.2", "nbclient==0.11.0", "nbformat==5.11.1", "ipykernel==7.4.0",
                  "nbconvert==7.17.2"],
    # The torch reference for logit parity tests only; the CPU build. Never a runtime dependency.
    "ref": ["torch==2.13.0"],
    "test": ["pytest==9.0.3", "pytest-timeout==2.4.0"],
    # Real environment suites (docs/environments.md); `make envs` installs all of
    # them and the Java runtime that scienceworld and textworld-express run in.
    "babyai": ["minigrid==3.2.0", "gymnasium==1.4.0", "pygame-ce==2.5.8"],
    "scienceworld": ["scienceworld==1.2.3", "py4j==0.10.9.9"],
    "twx": ["textworld-express==1.1.0", "py4j==0.10.9.9", "orjson==3.13.0",
            "prompt-toolkit==3.0.53"],

    # The documentation site (`make docs`: MkDocs, API reference by mkdocstrings from docstrings).
    "docs": ["mkdocs==1.6.1", "mkdocstrings==1.0.8", "mkdocstrings-python==2.0.11"],

    # Weights & Biases logging beside TensorBoard (train.wandb=True; offline unless WANDB_MODE).
    "wandb": ["wandb==0.31.0"],
}

setuptools.setup(
    name="rised_jax",
    version="0.1.0",
    description="RISED and CriPO: rubric-guided RL for LLM agents, in JAX",
    license="Apache-2.0",
    packages=setuptools.find_packages(include=["rised_jax", "rised_jax.*"]),
    package_data={"rised_jax": ["**/*.json", "**/*.txt", "**/*.jinja", "**/*.jsonl"]},
    python_requires=">=3.11",
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS_REQUIRE,
    entry_points={
        "console_scripts": [
            "rised-train=rised_jax.main:train_entry",
            "rised-eval=rised_jax.main:eval_entry",
            "rised-compare=rised_jax.compare:main",
        ]
    },
)
