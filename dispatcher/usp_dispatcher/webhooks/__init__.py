"""The business side of the webhook pipeline: events handed over (intake), subscriptions and
platform profiles registered, endpoints probed, sample events. Imports the domains, never a surface."""
