from kvdoctor.cli import main

raise SystemExit(main())
