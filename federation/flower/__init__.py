"""Flower side of the federation: the ServerApp/ClientApp and the deployment kit (certificates, keys, processes)."""
