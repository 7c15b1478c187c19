"""The HTTP server: OpenAI Chat Completions and Responses, Anthropic Messages (deepseek-recipe)."""

from deepinfer.server.app import ServerConfig, create_app

__all__ = ["ServerConfig", "create_app"]
