"""Request bodies read and validated from their bytes without holding the event loop for long: the
structure of a JSON body in linear time (`structure`) and its validation in parts (`body`)."""
