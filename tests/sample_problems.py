"""Small hand-written word problems with worked solutions, shared by the library and generalization tests."""

from __future__ import annotations

from kvgraft.generalization.problems import Problem

PROBLEMS = [
    Problem("p-apples", "Mia has 12 apples. She gives 5 to Sam. How many apples does she have left?", "7",
            "She has 12 - 5 = 7 apples.", "test"),
    Problem("p-pens", "A box holds 8 pens. How many pens are in 7 boxes?", "56", "7 boxes hold 7 * 8 = 56 pens.", "test"),
    Problem("p-pages", "Tom reads 9 pages a day for 4 days. How many pages does he read?", "36", "He reads 9 * 4 = 36 pages.",
            "test"),
    Problem("p-train", "A train travels 60 km per hour for 3 hours. How far does it go?", "180", "It goes 60 * 3 = 180 km.",
            "test"),
    Problem("p-stamps", "Ann has 30 stamps and buys 12 more. How many stamps does she have?", "42", "She has 30 + 12 = 42.",
            "test"),
    Problem("p-buns", "A baker makes 5 trays of 6 buns. How many buns are there?", "30", "There are 5 * 6 = 30 buns.", "test"),
    Problem("p-marbles", "Leo had 50 marbles and lost 14. How many marbles are left?", "36", "He has 50 - 14 = 36 left.",
            "test"),
    Problem("p-chairs", "There are 4 rows of 9 chairs. How many chairs are there?", "36", "There are 4 * 9 = 36 chairs.",
            "test"),
]
