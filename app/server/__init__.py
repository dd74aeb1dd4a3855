"""The local OpenAI-compatible server inside the app: the Server panel and its step loop on the app's worker."""
