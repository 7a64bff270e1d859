from straitmq.cli.main import main

main()
