"""pytest plugin (``-p toy_plugin``): register the toy algorithm before tests are collected."""

import toy_algorithm  # noqa: F401  (the one import line of the recipe)
