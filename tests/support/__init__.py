"""What the tests share beyond fixtures: random meshes (`meshgen`) and the comparison of a bus with `settle()`
(`differential`)."""
