"""Rules, matcher, correlation engine, faust app, sinks and CLI of rootrank."""
