"""The command line, `devbridge` (`main`): its option parsing (`args`) and the model checks it
runs (`check`)."""
