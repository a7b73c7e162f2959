"""URLs of the test project: the admin, the task API under executor/api/, and
django-prometheus's /metrics view (the default registry, with the executor's metrics) when
django-prometheus is installed (the test extra; the demo runs without it)."""

from importlib.util import find_spec

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("executor/api/", include("django_reliable_executor.api.urls")),
]
if find_spec("django_prometheus") is not None:
    urlpatterns.append(path("", include("django_prometheus.urls")))
