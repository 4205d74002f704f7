"""Django's own task tests run against Tether: the settings, the test-only backend and the
runner that tests/system/test_django_conformance.py starts (Django's test modules come from
Django's source distribution at test time; none of them is kept here)."""
