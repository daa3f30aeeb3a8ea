"""Hold what the harness reads at run time, shipped inside the package.

``fixtures``, ``scenarios`` and ``docker-compose.yml`` here are symbolic links to the folders at
the repository root (the layout the product card fixes): an editable install reads the
checkout's files through them, and building a wheel copies their contents into the package
(``[tool.setuptools.package-data]`` in pyproject.toml). Read them through ``harness.resources``.
"""
