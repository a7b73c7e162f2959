"""Django Tasks (``@task``) of the test project, run by the ReliableExecutorBackend."""
