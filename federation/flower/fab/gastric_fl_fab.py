"""Entry points of the Flower app bundle: the gastric-fl server loop and hospital (federation.flower.apps)."""

from federation.flower.apps import server_app
from federation.flower.hospital_app import client_app

server = server_app()
client = client_app()
