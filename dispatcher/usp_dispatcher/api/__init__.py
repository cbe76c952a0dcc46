"""The HTTP API: ``create_app`` (:mod:`.app`) and one module of routes per surface — thin adapters
from requests to the services, the domains and the delivery engine. May import everything below."""
