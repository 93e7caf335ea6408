"""CLI commands of the model ports, one module each; registered on the app in mlxnet/cli.py."""
