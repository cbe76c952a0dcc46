"""UCAP: the content server (publications, posts, tiers; agents' subscriptions, payments and
entitlements) behind the signed ``/v1`` API and the five MCP tools. May import the scheduling
domain's table base, ``access`` and the delivery engine; never the routes or the MCP layer."""
