"""Array math of the objective, no model: advantage estimators, group filtering, losses,
failure classes."""
