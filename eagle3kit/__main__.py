from eagle3kit.cli import main

main()
