"""SwarmLLM node: an OpenAI-compatible API over local and peer-split LLM inference."""

__version__ = "0.1.0"
AGENT = f"swarmllm-py/{__version__}"
