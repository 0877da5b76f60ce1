from sparkbuild.cli import main

main()
