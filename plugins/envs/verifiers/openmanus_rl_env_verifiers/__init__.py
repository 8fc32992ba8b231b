"""verifiers (0.4, v1 API) environments trained through the gateway: ``env=verifiers env.kwargs.id=<id>``."""
