from lowvram_gen.cli.main import main

raise SystemExit(main())
