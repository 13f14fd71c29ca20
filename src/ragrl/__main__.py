from ragrl.cli import main

main()
