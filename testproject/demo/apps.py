"""The demo app: handlers used by the README demo and the test suite."""

from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "demo"
