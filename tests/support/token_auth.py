"""A bearer-token login for a real `mlflow server --app-name basic-auth`, through MLflow's own hook for one
(the auth config's `authorization_function`): a request whose `Authorization: Bearer TOKEN` carries the
token in the server's LEANER_TEST_TOKEN acts as the admin; any other is refused (401). It stands for a site's
token login (an identity provider behind the server), which MLflow's client uses when MLFLOW_TRACKING_TOKEN
is set and no username and password are.

The server imports it by name: tests/support on its PYTHONPATH (support.servers.token_server).
"""

from __future__ import annotations

import os

from flask import Response, request
from werkzeug.datastructures import Authorization


def authenticate() -> Authorization | Response:
    """The request's identity (the admin's, MLFLOW_AUTH_ADMIN_USERNAME) for the right token; else a 401."""
    if request.headers.get("Authorization") == f"Bearer {os.environ['LEANER_TEST_TOKEN']}":
        return Authorization("bearer", {"username": os.environ["MLFLOW_AUTH_ADMIN_USERNAME"]})
    return Response("a bearer token MLflow's client sends (MLFLOW_TRACKING_TOKEN) is required", 401)
