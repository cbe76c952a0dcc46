"""HTTP routes: thin adapters from requests to the service functions (and back to JSON)."""
