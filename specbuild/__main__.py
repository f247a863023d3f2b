from specbuild.cli.app import main

main()
