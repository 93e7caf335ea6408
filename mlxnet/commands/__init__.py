"""The CLI commands, one module each (the function of the module's name is the command);
registered on the app in mlxnet/cli.py."""
