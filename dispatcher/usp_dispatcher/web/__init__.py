"""What every HTTP surface (the REST API, ``/mcp``, the console) shares: request dependencies,
admin authentication, RFC 9457 problems, the request guard. Imports only ``errors``."""
