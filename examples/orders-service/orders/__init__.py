"""The orders service: the stage that places an order and tells the shipping service."""
