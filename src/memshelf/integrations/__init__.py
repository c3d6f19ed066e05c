"""Adapters to the frameworks assistants are built with. Each lives in its own module and imports its framework
only there, so `import memshelf` stays light: `memshelf.integrations.openai_agents` needs `memshelf[agents]`."""

__all__: list[str] = []
