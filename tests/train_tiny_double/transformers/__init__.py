__version__ = "mock"
