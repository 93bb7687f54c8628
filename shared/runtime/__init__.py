"""The runtime every service shares: configuration, logging, and the shape of main()."""
